"""cffi builder for paracell._seccomp: libseccomp, to compile a container's
linux.seccomp into the classic-BPF program the guest agent installs.

Compiling on the host with the library runc and crun use gives the guest the
same program, byte for byte, that libseccomp would load on a host, so the
semantics (architectures, argument comparisons, rule merging) are
libseccomp's and not a reimplementation.  Kept apart from paracell._native:
only create needs it.
"""

from __future__ import annotations

from cffi import FFI

# The subset of <seccomp.h> that runtime/inguest/seccomp.py calls; cffi checks each
# declaration against the real header when it compiles the module.
CDEF = """
typedef void *scmp_filter_ctx;
typedef uint64_t scmp_datum_t;
enum scmp_compare {
    SCMP_CMP_NE = 1, SCMP_CMP_LT = 2, SCMP_CMP_LE = 3, SCMP_CMP_EQ = 4,
    SCMP_CMP_GE = 5, SCMP_CMP_GT = 6, SCMP_CMP_MASKED_EQ = 7, ...
};
struct scmp_arg_cmp {
    unsigned int arg;
    enum scmp_compare op;
    scmp_datum_t datum_a;
    scmp_datum_t datum_b;
};
enum scmp_filter_attr { SCMP_FLTATR_CTL_OPTIMIZE, ... };

#define SCMP_ACT_KILL_PROCESS ...
#define SCMP_ACT_KILL_THREAD ...
#define SCMP_ACT_TRAP ...
#define SCMP_ACT_LOG ...
#define SCMP_ACT_ALLOW ...
#define SCMP_ACT_NOTIFY ...
#define __NR_SCMP_ERROR ...

scmp_filter_ctx seccomp_init(uint32_t def_action);
void seccomp_release(scmp_filter_ctx ctx);
uint32_t seccomp_arch_resolve_name(const char *arch_name);
uint32_t seccomp_arch_native(void);
int seccomp_arch_add(scmp_filter_ctx ctx, uint32_t arch_token);
int seccomp_arch_exist(const scmp_filter_ctx ctx, uint32_t arch_token);
int seccomp_syscall_resolve_name(const char *name);
int seccomp_attr_set(scmp_filter_ctx ctx, enum scmp_filter_attr attr, uint32_t value);
int seccomp_rule_add_array(scmp_filter_ctx ctx, uint32_t action, int syscall,
                           unsigned int arg_cnt, const struct scmp_arg_cmp *arg_array);
int seccomp_export_bpf(const scmp_filter_ctx ctx, int fd);

/* SCMP_ACT_ERRNO and SCMP_ACT_TRACE are function-like macros. */
uint32_t pc_scmp_act_errno(uint16_t errno_ret);
uint32_t pc_scmp_act_trace(uint16_t msg);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "paracell._seccomp",
    """
#include <seccomp.h>
static uint32_t pc_scmp_act_errno(uint16_t e) { return SCMP_ACT_ERRNO(e); }
static uint32_t pc_scmp_act_trace(uint16_t m) { return SCMP_ACT_TRACE(m); }
""",
    libraries=["seccomp"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
