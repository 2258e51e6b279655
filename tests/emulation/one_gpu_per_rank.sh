#!/bin/sh
# Runs a command the way a GPU cluster's launcher binds GPUs (Slurm's --gpus-per-task, or
# CUDA_VISIBLE_DEVICES set per rank): each local rank sees one GPU of its own, which it calls
# GPU 0. On the emulated CUDA target the node has PDTRAIN_CUDA_EMU_GPUS GPUs.
export CUDA_VISIBLE_DEVICES=$(( ${OMPI_COMM_WORLD_LOCAL_RANK:-0} % ${PDTRAIN_CUDA_EMU_GPUS:-1} ))
exec "$@"
