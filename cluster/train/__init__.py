"""One iteration: the run, the driver (Trainer), its rollout phases (sync and async), the ledger
and the step metrics."""
