"""A plan as a launch configuration: reference trainer, Megatron-LM, DeepSpeed, Slurm, Kubernetes."""
