"""Before RL: expert demonstrations, behaviour cloning, and the auxiliary learners (SFT, DPO,
rejection sampling) on saved trajectories."""
