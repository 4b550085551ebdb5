"""weft_shared_library: a shared build of weft that loads with a plain dlopen.

    load("//tools:shared.bzl", "weft_shared_library")

    weft_shared_library(
        name = "libweft.so",              # the output file's name, exactly
        deps = ["//lib:weft"],
        version_script = ":weft_lds",     # optional: a linker version script (what is exported)
        soname = "libweft.so.0",          # optional: the DT_SONAME (-Wl,-soname,...)
    )

gives `libweft.so` as the target's default output (usable in data = [...], genrule srcs,
sh_test args with $(rootpath ...), cc_binary srcs), built so that a program that does not link
weft (Python's ctypes, a JNI library, a plugin host) can dlopen it with RTLD_NOW | RTLD_LOCAL and
no GLIBC_TUNABLES:

  * its deps are built as `--define=weft_metadata=libc` would build them (a Starlark transition,
    _metadata_libc below, so no flag on the command line): lib/core keeps its host records on
    the C library's heap instead of the private jemalloc, whose initial-exec TLS (DF_STATIC_TLS,
    2.6 KB) does not fit glibc's static TLS surplus for dlopen'ed libraries ("cannot allocate
    memory in static TLS block");
  * it links with -Wl,--as-needed, so the toolchain's default -lstdc++ (and gcc's libgcc_s) do not
    end up in NEEDED: weft is C and uses neither.

Everything else about the configuration (-c opt, --config=asan, ...) is the build's own. Static
and other builds of weft (//lib:weft and whatever links it) are untouched and keep jemalloc.
tests/shared checks both (plus dlopen and Python's ctypes) for each library it lists.
"""

load("@rules_cc//cc:defs.bzl", "cc_binary")

# What --define=weft_metadata=libc does to lib/core (lib/core/BUILD, config_setting metadata_libc)
# is -DWEFT_META_LIBC on its sources and no :jemalloc in its deps. This repository's Bazel (4.x)
# refuses Starlark transitions on --define ("not supported"), so the transition adds the same
# -DWEFT_META_LIBC to --copt instead: meta.c then never references weft__je_*, and the linker takes
# nothing from the renamed jemalloc archive still on the link line (a plain archive, not
# alwayslink), hence no initial-exec TLS. tests/shared fails if that ever stops holding. With a
# Bazel that can transition --define (or a build setting in lib/core), set that instead.
_META_LIBC_COPT = "-DWEFT_META_LIBC"

def _metadata_libc_impl(settings, attr):
    copts = settings["//command_line_option:copt"]
    if _META_LIBC_COPT in copts:
        return {"//command_line_option:copt": copts}
    return {"//command_line_option:copt": copts + [_META_LIBC_COPT]}

# Builds the shared library's objects with lib/core's libc metadata backend, whatever the command
# line says (everything else about the configuration is the build's own).
_metadata_libc = transition(
    implementation = _metadata_libc_impl,
    inputs = ["//command_line_option:copt"],
    outputs = ["//command_line_option:copt"],
)

def _shared_library_impl(ctx):
    library = ctx.attr.library
    if type(library) == "list":  # a Starlark transition's attribute is a list in some Bazel versions
        library = library[0]
    files = library[DefaultInfo].files.to_list()
    if len(files) != 1:
        fail("%s: expected one file from %s, got %s" % (ctx.label, ctx.attr.library, files))
    out = ctx.actions.declare_file(ctx.label.name)
    ctx.actions.run_shell(
        inputs = files,
        outputs = [out],
        command = 'cp -f "$1" "$2"',
        arguments = [files[0].path, out.path],
        mnemonic = "WeftSharedLibrary",
        progress_message = "Copying %s (weft_metadata=libc)" % out.short_path,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

# The .so linked in the libc-metadata configuration, copied to `name` in the build's own
# configuration (so its path is bazel-bin/<package>/<name>, the same as a cc_binary's).
_weft_shared_library = rule(
    implementation = _shared_library_impl,
    attrs = {
        "library": attr.label(mandatory = True, cfg = _metadata_libc),
        # Bazel requires this attribute on a rule that uses a Starlark transition.
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)

def weft_shared_library(name, deps, version_script = None, soname = None, linkopts = [], visibility = None, tags = [], testonly = False, **kwargs):
    """A dlopen-safe shared library `name` (e.g. "libweft.so") of `deps`.

    Args:
      name: the target's and the output file's name, e.g. "libweft.so".
      deps: the cc_library targets linked in (each with alwayslink where its symbols must stay).
      version_script: optional label of a linker version script (a file or a rule giving one).
      soname: optional DT_SONAME of the library, e.g. "libweft.so.0" (-Wl,-soname,...); the output
        file keeps the name `name` (tools/install.sh installs it under the versioned name).
      linkopts: more linker options, after -Wl,--as-needed.
      visibility, tags, testonly: as for any rule; they apply to the `name` target.
      **kwargs: passed on to the underlying cc_binary (srcs, copts, features, ...).
    """
    link = "_%s_link" % name
    opts = ["-Wl,--as-needed"]
    inputs = []
    if version_script:
        opts.append("-Wl,--version-script=$(location %s)" % version_script)
        inputs.append(version_script)
    if soname:
        opts.append("-Wl,-soname," + soname)

    # The link itself, only ever built through `name` (hence manual: `bazel build //...` would
    # otherwise also build it in the default, jemalloc, configuration).
    cc_binary(
        name = link,
        deps = deps,
        linkshared = 1,
        linkopts = opts + linkopts,
        additional_linker_inputs = inputs,
        tags = ["manual"],
        testonly = testonly,
        visibility = ["//visibility:private"],
        **kwargs
    )
    _weft_shared_library(
        name = name,
        library = ":" + link,
        tags = tags,
        testonly = testonly,
        visibility = visibility,
    )
