#!/usr/bin/env bash
# Capture the traces bundled in gmlake/sim/data/traces on a GPU: each workload under PyTorch's native allocator and under
# expandable segments (needs transformers and peft). Writes $OUT/traces.tar (the .gmtrace files) and
# $OUT/tiny.pickle.gz (a raw snapshot for the trace reader's tests).
. "$(dirname "$0")/common.sh"
work=$(mktemp -d)
mkdir -p "$work/traces"
run() {  # name alloc args...
  local name=$1 alloc=$2; shift 2
  local conf=""
  [ "$alloc" = expandable ] && conf="expandable_segments:True"
  echo "== $name-$alloc"
  PYTORCH_CUDA_ALLOC_CONF=$conf python3 -m gmlake capture -o "$work/$name-$alloc.pickle.gz" --name "$name-$alloc" \
    -- python3 -m bench.workloads.train_hf "$@" || return 1
  python3 -m gmlake convert "$work/$name-$alloc.pickle.gz" -o "$work/traces/$name-$alloc.gmtrace" || return 1
  rm -f "$work/$name-$alloc.pickle.gz"
}
for alloc in native expandable; do
  run gpt2l-lora-ckpt $alloc --model gpt2-large --lora --ckpt --steps 40 --min-batch 4 --max-batch 16
  run opt1.3b-lora $alloc --model opt-1.3b --lora --steps 40 --min-batch 2 --max-batch 8
  run opt350m-full-ckpt $alloc --model opt-350m --ckpt --steps 40 --min-batch 4 --max-batch 16
done
PYTORCH_CUDA_ALLOC_CONF= python3 -m gmlake capture -o "$OUT/tiny.pickle.gz" --name tiny-gpt2 \
  -- python3 -m bench.workloads.train_hf --model gpt2 --steps 3 --min-batch 2 --max-batch 4 --max-seq 256
tar -C "$work/traces" -cf "$OUT/traces.tar" .
ls -la "$work/traces" "$OUT"
