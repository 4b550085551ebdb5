"""weft's external repositories, declared by `weft_dependencies()` from a WORKSPACE.

Everything here is found on the local machine; nothing is downloaded:
  @rules_cc, @rules_java, @remote_coverage_tools  offline stand-ins kept in third_party/ (only
                                                  declared when the WORKSPACE has not already)
  @local_cuda       the CUDA toolkit: headers and an nvcc wrapper (CUDA_PATH, else /usr/local/cuda)
  @system_jemalloc  Debian's libjemalloc_pic.a (WEFT_JEMALLOC_PIC overrides the archive's path)
"""

def _stand_in_impl(ctx):
    src = ctx.path(ctx.attr.marker).dirname
    for child in src.readdir():
        ctx.symlink(child, child.basename)

_stand_in = repository_rule(
    implementation = _stand_in_impl,
    attrs = {"marker": attr.label(mandatory = True)},
    doc = "Mirrors a folder of weft's third_party/ as a repository, wherever weft is checked out.",
)

def _cuda_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "") or "/usr/local/cuda"
    header = ctx.path(root + "/include/cuda.h")
    if not header.exists:
        fail("weft: no CUDA toolkit found at '%s' (no include/cuda.h). Install the CUDA toolkit, " % root +
             "or set CUDA_PATH to its root, e.g. `bazel build --repo_env=CUDA_PATH=/opt/cuda ...`.")
    ctx.symlink(root + "/include", "include")
    nvcc = root + "/bin/nvcc"
    ctx.file("nvcc.sh", "#!/bin/sh\nexec '%s' \"$@\"\n" % nvcc, executable = True)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# The driver API headers, NVTX v3 (header-only) and what nccl.h includes (the runtime API's
# headers): weft never links libcuda or NCCL, it loads them at run time.
cc_library(
    name = "headers",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/nv/**", "include/crt/*.h", "include/crt/*.hpp", "include/nvtx3/*.h", "include/nvtx3/nvtxDetail/*.h"]),
    includes = ["include"],
)

sh_binary(
    name = "nvcc",
    srcs = ["nvcc.sh"],
)

# Set when the toolkit has a working nvcc.
exports_files(["nvcc.sh"])
""")

cuda_toolkit = repository_rule(
    implementation = _cuda_impl,
    environ = ["CUDA_PATH"],
    local = True,
    doc = "The local CUDA toolkit's headers and nvcc.",
)

def _jemalloc_impl(ctx):
    candidates = [ctx.os.environ.get("WEFT_JEMALLOC_PIC", "")] + [
        "/usr/lib/x86_64-linux-gnu/libjemalloc_pic.a",
        "/usr/lib/aarch64-linux-gnu/libjemalloc_pic.a",
        "/usr/lib64/libjemalloc_pic.a",
        "/usr/lib/libjemalloc_pic.a",
    ]
    archive = None
    for c in candidates:
        if c and ctx.path(c).exists:
            archive = c
            break
    if archive == None:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
filegroup(name = "archive", srcs = [])
""")
        ctx.file("MISSING", "libjemalloc_pic.a not found; install libjemalloc-dev or build with --define=weft_metadata=libc\n")
        return
    ctx.symlink(archive, "libjemalloc_pic.a")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
filegroup(name = "archive", srcs = ["libjemalloc_pic.a"])
""")

system_jemalloc = repository_rule(
    implementation = _jemalloc_impl,
    environ = ["WEFT_JEMALLOC_PIC"],
    local = True,
    doc = "Debian's position-independent jemalloc archive (renamed before weft links it).",
)

def weft_dependencies():
    """Declares the repositories weft needs; safe to call from a consumer's WORKSPACE."""
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        if not native.existing_rule(name):
            _stand_in(name = name, marker = "@weft//third_party/%s:WORKSPACE" % name)
    if not native.existing_rule("local_cuda"):
        cuda_toolkit(name = "local_cuda")
    if not native.existing_rule("system_jemalloc"):
        system_jemalloc(name = "system_jemalloc")
