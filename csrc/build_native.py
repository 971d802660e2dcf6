"""cffi builder for paracell._native (the relay and frame I/O in csrc/)."""

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
ffibuilder.cdef(
    """
    #define PC_HOST_ACK 40
    #define PC_END_EXIT 0
    #define PC_END_HANGUP 1
    #define PC_END_VIOLATION 2
    #define PC_END_ERROR 3
    struct pc_relay_cfg {
        int chan_fd; int listen_fd; int in_fd; int out_fd; int err_fd; int tty_fd;
        unsigned long long forward_mask;
    };
    struct pc_relay_result { int end; int status; char message[256]; };
    int pc_relay(const struct pc_relay_cfg *cfg, struct pc_relay_result *res);
    int pc_send_frame(int fd, unsigned type, unsigned chan, const char *buf, unsigned len);
    int pc_recv_frame(int fd, unsigned *type, unsigned *chan, char *buf, unsigned cap,
                      int timeout_ms);
    int pc_set_pdeathsig(int sig);
    """
)
ffibuilder.set_source(
    "paracell._native",
    '#include "relay.h"',
    sources=[str(HERE / "relay.c")],
    include_dirs=[str(HERE)],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
