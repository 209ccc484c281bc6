#!/bin/bash
# Llama 3.1 8B on 2 x 8 H100 with more model parallelism and recompute than it needs.
GPUS_PER_NODE=8
NNODES=2
TP=8
PP=2

MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128
    --seq-length 4096 --max-position-embeddings 131072 --position-embedding-type rope
    --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
    --attention-dropout 0.0 --hidden-dropout 0.0
    --vocab-size 128256 --tokenizer-type NullTokenizer --mock-data
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size $PP
    --sequence-parallel
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" \
    --micro-batch-size 1 --global-batch-size 64 --bf16
