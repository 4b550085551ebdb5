"""weft_static_library: one static archive (libweft.a) of a cc_library and everything it links.

    load("//tools/install:static.bzl", "weft_static_library")

    weft_static_library(
        name = "libweft.a",          # the output file's name, exactly
        deps = ["//lib:weft"],
    )

Bazel 4 has no cc_static_library: a cc_library's archive holds its own sources only. This rule
takes every static library on `deps`' link line (CcInfo: each layer's archive, lib/core's renamed
jemalloc) and merges them with the toolchain's `ar -M` into `name`, a plain archive a C compiler
links with `-l` (members pulled in as needed, like any system library). It prefers the PIC
archives (usable in PIE executables and in shared objects) and fails when something on the link
line exists only as a shared library or as loose objects: the archive must stand alone.

A second output, `<name>.linkopts` (output group "linkopts"), lists the linker flags the
libraries ask for (their `linkopts`: -ldl, -lpthread, ...), one a line, in link order without
repeats: what a program linking the archive must add (tools/install.sh writes them into weft.pc's
Libs.private and weftConfig.cmake).
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _static_library_impl(ctx):
    archives = []
    seen = {}
    flags = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            for flag in linker_input.user_link_flags:
                if flag not in flags:
                    flags.append(flag)
            for lib in linker_input.libraries:
                archive = lib.pic_static_library or lib.static_library
                if archive == None:
                    fail("%s: %s is on the link line with no static archive (only %s)" % (
                        ctx.label,
                        linker_input.owner,
                        lib.dynamic_library or lib.interface_library or "objects",
                    ))
                if archive.path not in seen:
                    seen[archive.path] = True
                    archives.append(archive)
    if not archives:
        fail("%s: no static libraries on the link line of %s" % (ctx.label, ctx.attr.deps))

    out = ctx.actions.declare_file(ctx.label.name)
    script = ctx.actions.declare_file(ctx.label.name + ".mri")
    ctx.actions.write(
        script,
        "\n".join(["CREATE " + out.path] + ["ADDLIB " + a.path for a in archives] + ["SAVE", "END", ""]),
    )
    ar = find_cpp_toolchain(ctx).ar_executable
    ctx.actions.run_shell(
        inputs = archives + [script],
        outputs = [out],
        tools = find_cpp_toolchain(ctx).all_files,
        command = 'rm -f "$2" && "$1" -M < "$3" && "$1" s "$2"',
        arguments = [ar, out.path, script.path],
        mnemonic = "WeftStaticLibrary",
        progress_message = "Merging %d archives into %s" % (len(archives), out.short_path),
    )
    linkopts = ctx.actions.declare_file(ctx.label.name + ".linkopts")
    ctx.actions.write(linkopts, "".join([f + "\n" for f in flags]))
    return [
        DefaultInfo(files = depset([out, linkopts])),
        OutputGroupInfo(archive = depset([out]), linkopts = depset([linkopts])),
    ]

weft_static_library = rule(
    implementation = _static_library_impl,
    attrs = {
        "deps": attr.label_list(mandatory = True, providers = [CcInfo]),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    doc = "Merges every static archive on `deps`' link line into one archive, `name`.",
)
