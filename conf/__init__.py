"""Configuration: typed schemas, Hydra config groups, errors and the command line."""

__version__ = "0.1.0"
