"""cuda_library: compiles .cu files with nvcc (sm_90 plus PTX) into a cc_library.

The targets exist only under --config=cuda; without it they are incompatible and
`bazel build //...` skips them (so does everything that depends on them).
"""

CUDA_ONLY = select({
    "//bazel:cuda_enabled": [],
    "//conditions:default": ["@platforms//:incompatible"],
})

_NVCC = "/usr/local/cuda/bin/nvcc"

# --fmad=false keeps device arithmetic identical to the host's -ffp-contract=off path.
_NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "--fmad=false",
    "-Xcompiler=-fPIC",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
    "-I.",
    "-I$(GENDIR)",
])

def cuda_library(name, srcs, hdrs = [], nvcc_hdrs = [], deps = [], **kwargs):
    """A cc_library whose srcs are .cu files compiled by nvcc.

    Args:
      name: the library.
      srcs: .cu files.
      hdrs: public headers (plain C++, no CUDA headers, so host code can include them).
      nvcc_hdrs: further headers the .cu files include (from this or other packages).
      deps: cc deps of the host-side library.
      **kwargs: passed to cc_library.
    """
    objects = []
    for src in srcs:
        obj = "_%s_%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = obj.replace(".", "_"),
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = "%s %s -c $(location %s) -o $@" % (_NVCC, _NVCC_FLAGS, src),
            target_compatible_with = CUDA_ONLY,
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        target_compatible_with = CUDA_ONLY,
        **kwargs
    )
