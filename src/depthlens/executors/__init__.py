"""Where the numerical tasks of a run go: ``--executor local | ray[=ADDRESS] | slurm[=local]``.

The driver process of a run loads the model, runs the forward passes, submits pure
numerical tasks (one head's attention matrix of one chunk, a certified bracket, the depth
products of a chunk, a Jacobian's decompositions, a clamp arm's Kreiss work) to
:func:`depthlens.executors.local.executor`, and writes every finished unit through the run
directory itself, so runs resume alike whatever the executor. An executor only decides where
the tasks run; tasks carry their own seeds and results come back in submission order, so
the tables do not depend on it.

Executors
---------
``local`` (default)
    ``--jobs`` single-threaded worker processes on this machine (:mod:`depthlens.executors.local`).
``ray``
    A private Ray instance started for the stage with ``--jobs`` CPUs.
``ray=HOST:PORT``, ``ray=auto``
    An existing Ray cluster (``ray start --head --port=PORT`` on one machine, ``ray start
    --address=HOST:PORT`` on the others); ``auto`` takes ``RAY_ADDRESS``, else the cluster last
    started on this machine. Every node needs the same depthlens (and numpy, scipy, ...)
    installed: tasks travel as references to depthlens functions. See
    :mod:`depthlens.executors.ray_backend`.
``slurm``
    Job arrays through submitit's SLURM executor (``sbatch`` and ``srun`` on ``PATH``), set
    by ``--slurm-params`` (:func:`parse_slurm_params`); the job files go to
    ``RUN/logs/slurm``, so the run directory must be on a file system the compute nodes share.
    See :mod:`depthlens.executors.slurm_backend`.
``slurm=local``
    The same job arrays, each array task a process on this machine (submitit's
    ``LocalExecutor``): the SLURM code path without a cluster.

Everything an executor needs is checked before the model loads and before the run directory
is created (:func:`check_execution`): the spec, the SLURM keys, that Ray or submitit is
installed, that a Ray address answers, that ``sbatch`` exists. Ray and submitit are imported
only when a stage opens such an executor.
"""

from .spec import (
    Execution,
    ExecutorSpec,
    check_execution,
    job_folder,
    max_jobs,
    open_backend,
    parse_executor,
    parse_slurm_params,
    usable_cores,
)

__all__ = [
    "Execution",
    "ExecutorSpec",
    "check_execution",
    "job_folder",
    "max_jobs",
    "open_backend",
    "parse_executor",
    "parse_slurm_params",
    "usable_cores",
]
