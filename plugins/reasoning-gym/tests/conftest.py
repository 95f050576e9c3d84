# The plugin first: where pycosat is missing, it puts the stand-in in place before these modules import
# reasoning_gym themselves.
import toolrl_reasoning_gym  # noqa: F401
