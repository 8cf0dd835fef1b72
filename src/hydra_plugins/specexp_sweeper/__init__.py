"""specexp's Hydra sweeper (hydra/sweeper=specexp, the default of conf/config.yaml): Hydra loads sweepers only
from the `hydra_plugins` namespace, so it lives here, beside the `specexp` package."""
