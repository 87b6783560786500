"""``fedcluster bench``: every algorithm and its baselines on one scenario matrix, one protocol.

* :mod:`~fedcluster_app.bench.matrix`: the scenarios (data x shift x drift pattern), the
  strategies, the common protocol and the cells (scenario, strategy, seed) of a matrix, with
  the cells a strategy cannot run and why;
* :mod:`~fedcluster_app.bench.runner`: runs the cells in a process pool, skipping finished runs;
* :mod:`~fedcluster_app.bench.scores`: what one run's ``metrics.jsonl`` says under the common
  scoring rule (current step after training, next step before adapting, drops, recovery, ARI,
  bytes, time, clusters in use);
* :mod:`~fedcluster_app.bench.stats`: which differences are real: intervals over seeds, ranks
  with ties within noise, Friedman and Nemenyi, pairwise Wilcoxon with Holm, the references
  (Oracle, Local) beside the ranking;
* :mod:`~fedcluster_app.bench.report`: the leaderboard (markdown), the per-run rows (JSON lines)
  and the plots.
"""
