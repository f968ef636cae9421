"""From measurements back to the model: probing a machine, grids of reference-trainer runs, the
run-record contract, measured and published runs, fitting efficiency factors, validation."""
