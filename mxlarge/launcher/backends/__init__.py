"""One class per launch backend, each in its own module: :mod:`.local` (127.0.0.1),
:mod:`.ssh`, :mod:`.mpi` and :mod:`.slurm` (dmlc_tracker's), over
:class:`.base.LaunchBackend`.

Which name runs which class is decided in :mod:`mxlarge.launcher.registry`, the one
place a backend is looked up by its name. Importing this package imports none of its
modules.
"""
