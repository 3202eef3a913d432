"""Training failures the CLI reports as one line and exit status 1 (no MXNet import here)."""


class DivergenceError(RuntimeError):
    """The training loss or gradient norm became non-finite or exploded."""


class ReplicaMismatch(RuntimeError):
    """A rank's weights differ from rank 0's: the job cannot continue."""
