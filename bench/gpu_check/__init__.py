"""`make gpu-check OUT=DIR`: every CUDA path of fxtune, end to end, in one command (issue 22).

`python -m bench.gpu_check --out DIR` (see `main` for the options). Without CUDA it writes a
"no CUDA device: nothing checked" status and exits 0; `--device cpu` is a dry run of the same
harness on the CPU with tiny budgets, which is how the harness itself is tested.
"""
