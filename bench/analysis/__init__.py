"""Numbers over stored runs: the sweep analysis (knee, Pareto front, recommendations), comparisons
of engines (native vs vLLM, memory efficiency), the book's reference tables, and the native engine's
tuning ablation (its runner, :mod:`~bench.analysis.tuning_ablation`, and what the Tuning page reads
from its results, :mod:`~bench.analysis.tuning`)."""
