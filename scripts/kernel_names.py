"""Short names of CUDA kernels from their mangled (Itanium) names, for the scripts that
list kernels one a line (ptxas_report.sh, sass.sh): `name<ints,bools>`, the kernel's own
identifier and its template arguments (attention: head dim first, then tile sizes; the
bools as b0/b1 in template order), without the anonymous-namespace hash, which changes
with the compile."""
import re


def kernel_identifier(mangled):
    """The length-prefixed identifier ending in _kernel, or None."""
    kernel = None
    for m in re.finditer(r"\d+", mangled):
        for k in range(len(m.group())):  # hex in anonymous-namespace names runs into it
            ident = mangled[m.end():m.end() + int(m.group()[k:])]
            if ident.endswith("_kernel") and re.fullmatch(r"[A-Za-z_]\w*", ident):
                kernel = ident
    return kernel


def short_name(mangled, leading=()):
    """name<leading..., ints..., b0/b1...>; the mangled name itself if no kernel is found."""
    ints = re.findall(r"Li(\d+)E", mangled)
    bools = ["b" + b for b in re.findall(r"Lb([01])E", mangled)]
    return "%s<%s>" % (kernel_identifier(mangled) or mangled, ",".join(list(leading) + ints + bools))
