"""toolrl plugin: the ``tensorboard``, ``wandb`` and ``mlflow`` metric loggers (``trainer.loggers``).

Lazy references: listing plugins imports none of the three libraries.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_loggers(register: Register) -> None:
    register("toolrl_loggers.tensorboard_logger:TensorBoardLogger", name="tensorboard")
    register("toolrl_loggers.wandb_logger:WandbLogger", name="wandb")
    register("toolrl_loggers.mlflow_logger:MlflowLogger", name="mlflow")
