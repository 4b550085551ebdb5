"""weft_cuda_fatbin: CUDA C kernels compiled by nvcc into a fatbin embedded in a cc_library.

    weft_cuda_fatbin(name = "test_kernels", srcs = ["test_kernels.cu"])

gives a cc_library `test_kernels` with header `test_kernels.h` declaring
`extern const unsigned char test_kernels_fatbin[]; extern const size_t test_kernels_fatbin_size;`
to pass to cuModuleLoadData. The fatbin holds SASS for sm_80 and sm_90 and PTX for compute_90
(so newer GPUs JIT it). Kernels should be `extern "C"` so cuModuleGetFunction finds them by name.
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

WEFT_CUDA_ARCHS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def weft_cuda_fatbin(name, srcs, hdrs = [], visibility = None):
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs,
        outs = [name + ".fatbin"],
        cmd = "$(location @local_cuda//:nvcc) -fatbin -O3 -std=c++17 -I. -Iexternal/weft %s -o $@ %s" % (
            " ".join(WEFT_CUDA_ARCHS),
            " ".join(["$(location %s)" % s for s in srcs]),
        ),
        tools = ["@local_cuda//:nvcc"],
    )
    native.genrule(
        name = name + "_embed",
        srcs = [name + ".fatbin"],
        outs = [name + "_fatbin.c", name + ".h"],
        cmd = "$(location //tools:fatbin_to_c.sh) %s_fatbin $(location %s.fatbin) $(location %s_fatbin.c) $(location %s.h)" % (name, name, name, name),
        tools = ["//tools:fatbin_to_c.sh"],
    )
    cc_library(
        name = name,
        srcs = [name + "_fatbin.c"],
        hdrs = [name + ".h"],
        visibility = visibility,
    )
