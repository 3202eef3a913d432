"""Reporting: a sweep's MLflow runs turned into the numbers Goyal et al. report, the study over
seeds, markdown tables and plots (``mxlarge report NAME``).

Plain data in and out: :mod:`~mxlarge.reporting.store` reads the runs through
:mod:`mxlarge.tracking` (the only ``mlflow`` import) into :class:`~mxlarge.reporting.runs.RunData`
records, and the rest is arithmetic and rendering over those records, so tests build runs by hand
and a report never imports MXNet. The modules, each importing only those before it: ``runs``
(the records, the metric names, which runs a report uses), ``store`` (the MLflow reads),
``summary`` (the numbers of the sweep table), ``study`` (target, Welch, MLPerf per label),
``tables`` (every markdown), ``plots`` (every plot, a run's training curves included) and ``cli``
(``write_report`` and the verb). The statistics proper are :mod:`mxlarge.stats`, which training
uses too.
"""
