"""The experiment harness: studies (grids over registry names), the resumable runner, the results
store, pandas tables and plots. See experiments/ for study files."""

from specbench.bench.study import DatasetSpec, Grid, Study, StudyError, TableSpec, load_study

__all__ = ["DatasetSpec", "Grid", "Study", "StudyError", "TableSpec", "load_study"]
