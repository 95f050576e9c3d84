# Where pycosat is missing, the generators put the stand-in in place before these modules import
# reasoning_gym themselves.
import toolrl_reasoning_gym.generators  # noqa: F401
