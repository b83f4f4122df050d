#!/bin/sh
# What the image's engine needs at run time, checked at build time (Dockerfile) and by the tests:
#   gpu: a C compiler that builds a Python extension, as Triton builds its GPU launcher on a
#        worker's first kernel (the compiler from $CC, else gcc, else clang, as Triton looks)
#   cpu: vLLM's CPU kernels load (vllm/_C*.so link libnuma.so.1), the build vLLM picks for this
#        CPU (_C needs AVX-512 with BF16, _C_AVX512 AVX-512, _C_AVX2 the rest: importing _C
#        itself on an AVX2-only host dies of SIGILL)
set -eu
case "${1:?usage: check-engine.sh gpu|cpu}" in
  gpu)
    cc="${CC:-$(command -v gcc || command -v clang || true)}"
    [ -n "$cc" ] || { echo "no C compiler: Triton cannot build its launcher" >&2; exit 1; }
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    printf '%s\n' '#include <Python.h>' '#include <dlfcn.h>' \
      'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "cc_check", NULL, -1, NULL};' \
      'PyMODINIT_FUNC PyInit_cc_check(void) { return PyModule_Create(&m); }' > "$dir/cc_check.c"
    include=$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    "$cc" -shared -fPIC -O1 -I"$include" "$dir/cc_check.c" -o "$dir/cc_check.so"
    python -c "import sys; sys.path.insert(0, '$dir'); import cc_check"
    echo "gpu engine: $cc builds Python extensions" ;;
  cpu)
    python -c "import torch; from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()
assert hasattr(torch.ops._C, 'rms_norm'), 'no CPU kernels loaded'"
    echo "cpu engine: vLLM's CPU kernels load" ;;
  *) echo "unknown engine: $1" >&2; exit 2 ;;
esac
