#!/usr/bin/env bash
# A Hugging Face Trainer fine-tune under the DeepSpeed launcher, as its docs write it.
set -euo pipefail
NUM_NODES=2
deepspeed --num_nodes $NUM_NODES --num_gpus 8 \
  run_clm.py \
  --model_name_or_path meta-llama/Llama-3.1-8B \
  --block_size 4096 \
  --per_device_train_batch_size 2 \
  --deepspeed ds_config_zero2.json \
  --output_dir out
