"""The cost model: shapes and parameter counts, FLOPs, memory, communication, the pipeline, step
time, one vectorised evaluation, the search, and the plan built from it. Pure numpy; no files
are read on import."""
