"""weft_cuda_fatbin: CUDA C kernels compiled by nvcc into a fatbin embedded in a cc_library.

    load("@weft//tools:cuda.bzl", "weft_cuda_fatbin")   # "//tools:cuda.bzl" inside weft
    weft_cuda_fatbin(name = "test_kernels", srcs = ["test_kernels.cu"])

gives a cc_library `test_kernels` with header `test_kernels.h` declaring
`extern const unsigned char test_kernels_fatbin[]; extern const size_t test_kernels_fatbin_size;`
to pass to cuModuleLoadData. The fatbin holds SASS for sm_80 and sm_90 and PTX for compute_90
(so newer GPUs JIT it). Kernels should be `extern "C"` so cuModuleGetFunction finds them by name.

Works from weft's own workspace and from any workspace that has weft as an external repository:
the tools below are Labels, resolved in weft's repository (and its @local_cuda), not the caller's.
nvcc must be installed (the CUDA toolkit at CUDA_PATH or /usr/local/cuda, as tools/setup.sh
requires): there is no fallback, a build without it fails in the `<name>_nvcc` action.
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

WEFT_CUDA_ARCHS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# Resolved where this file lives (weft's repository), whichever workspace calls the macro.
_NVCC = Label("@local_cuda//:nvcc")
_FATBIN_TO_C = Label("//tools:fatbin_to_c.sh")

# weft's root in the execroot: "" when weft is the main repository, "external/weft" otherwise
# (so that kernels can include weft's headers either way).
_WEFT_ROOT = Label("//:BUILD").workspace_root

def weft_cuda_fatbin(name, srcs, hdrs = [], visibility = None):
    includes = ["-I."] + (["-I" + _WEFT_ROOT] if _WEFT_ROOT else [])
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs,
        outs = [name + ".fatbin"],
        cmd = "$(location %s) -fatbin -O3 -std=c++17 %s %s -o $@ %s" % (
            str(_NVCC),
            " ".join(includes),
            " ".join(WEFT_CUDA_ARCHS),
            " ".join(["$(location %s)" % s for s in srcs]),
        ),
        tools = [_NVCC],
    )
    native.genrule(
        name = name + "_embed",
        srcs = [name + ".fatbin"],
        outs = [name + "_fatbin.c", name + ".h"],
        cmd = "$(location %s) %s_fatbin $(location %s.fatbin) $(location %s_fatbin.c) $(location %s.h)" % (
            str(_FATBIN_TO_C),
            name,
            name,
            name,
            name,
        ),
        tools = [_FATBIN_TO_C],
    )
    cc_library(
        name = name,
        srcs = [name + "_fatbin.c"],
        hdrs = [name + ".h"],
        visibility = visibility,
    )
