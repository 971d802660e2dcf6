/* Port forwarding, host side: steering loopback connections to the shim.
 *
 * containerd's PortForward (and anyone who runs `nsenter --net`) connects to
 * 127.0.0.1:PORT or [::1]:PORT in the pod's network namespace on the host,
 * where nothing listens: the pod's servers are in the VM.  A BPF sk_lookup
 * program attached to that namespace hands every such TCP connection, for
 * any port, to one of two listeners of the shim; the accepted socket's own
 * address (getsockname) is the address and port the client dialled, which
 * the relay (csrc/streams.c) asks the agent to connect to in the guest.
 *
 * Why sk_lookup and not a netfilter REDIRECT rule (docs/networking.md): the
 * kernel detaches the program when the last fd of its link closes, so the
 * steering ends with the shim however the shim ends, even by SIGKILL, and
 * nothing is ever left in a namespace that CNI and containerd own; no NAT or
 * conntrack is involved, and there is no rule for anyone to clean up.
 *
 * The program is 35 instructions, assembled below with named labels and
 * checked by the kernel's verifier when it is loaded. */
#define _GNU_SOURCE
#include "portfwd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LISTEN_BACKLOG 128
/* Sockmap keys: which listener takes which family. */
enum { KEY_INET, KEY_INET6, KEYS };

static long sys_bpf(int cmd, union bpf_attr *attr)
{
    return syscall(SYS_bpf, cmd, attr, sizeof *attr);
}

/* ---- a tiny assembler: instructions and forward jumps to labels ---- */

enum label { L_PASS, L_INET6, L_LOOKUP, LABELS };
#define MAX_INSNS 48
#define MAX_FIXUPS 16

struct prog {
    struct bpf_insn insn[MAX_INSNS];
    int n;
    int fix_at[MAX_FIXUPS];
    enum label fix_to[MAX_FIXUPS];
    int nfix;
    int label_at[LABELS];
};

static void emit(struct prog *p, struct bpf_insn insn)
{
    if (p->n < MAX_INSNS)
        p->insn[p->n] = insn;
    p->n++; /* an overflow makes the count too large, which link() refuses */
}

static struct bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm)
{
    return (struct bpf_insn){.code = code, .dst_reg = dst, .src_reg = src, .off = off, .imm = imm};
}

/* if (reg OP imm) goto to */
static void jump_imm(struct prog *p, uint8_t op, uint8_t reg, int32_t imm, enum label to)
{
    if (p->nfix < MAX_FIXUPS) {
        p->fix_at[p->nfix] = p->n;
        p->fix_to[p->nfix] = to;
    }
    p->nfix++;
    emit(p, insn(BPF_JMP | op | BPF_K, reg, 0, 0, imm));
}

static void place(struct prog *p, enum label l)
{
    p->label_at[l] = p->n;
}

static int link_jumps(struct prog *p)
{
    if (p->n > MAX_INSNS || p->nfix > MAX_FIXUPS)
        return -1;
    for (int i = 0; i < p->nfix; i++)
        p->insn[p->fix_at[i]].off = (int16_t)(p->label_at[p->fix_to[i]] - p->fix_at[i] - 1);
    return 0;
}

#define R0 0
#define R1 1
#define R2 2
#define R3 3
#define R6 6
#define R7 7
#define R10 10
#define CTX(field) ((int16_t)offsetof(struct bpf_sk_lookup, field))

static struct bpf_insn load_ctx32(uint8_t dst, int16_t off)
{
    return insn(BPF_LDX | BPF_MEM | BPF_W, dst, R6, off, 0);
}

static struct bpf_insn mov_reg(uint8_t dst, uint8_t src)
{
    return insn(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0);
}

static struct bpf_insn mov_imm(uint8_t dst, int32_t imm)
{
    return insn(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm);
}

static struct bpf_insn call(int32_t helper)
{
    return insn(BPF_JMP | BPF_CALL, 0, 0, 0, helper);
}

/* The sk_lookup program: a TCP lookup for 127.0.0.1 or ::1, any port, gets
 * the listener of its family from the sockmap; anything else, or a family
 * with no listener, goes on to the kernel's usual lookup (SK_PASS with no
 * socket chosen). */
static int assemble(struct prog *p, int map_fd)
{
    memset(p, 0, sizeof *p);
    emit(p, mov_reg(R6, R1));                                    /* r6 = ctx */
    emit(p, load_ctx32(R2, CTX(protocol)));
    jump_imm(p, BPF_JNE, R2, IPPROTO_TCP, L_PASS);
    emit(p, load_ctx32(R2, CTX(family)));
    jump_imm(p, BPF_JEQ, R2, AF_INET6, L_INET6);
    jump_imm(p, BPF_JNE, R2, AF_INET, L_PASS);
    emit(p, load_ctx32(R2, CTX(local_ip4)));                     /* network order */
    jump_imm(p, BPF_JNE, R2, (int32_t)htonl(INADDR_LOOPBACK), L_PASS);
    emit(p, mov_imm(R3, KEY_INET));
    jump_imm(p, BPF_JA, 0, 0, L_LOOKUP);

    place(p, L_INET6);                                           /* ::1 is 0, 0, 0, 1 */
    for (int word = 0; word < 4; word++) {
        emit(p, load_ctx32(R2, CTX(local_ip6[word])));
        jump_imm(p, BPF_JNE, R2, word == 3 ? (int32_t)htonl(1) : 0, L_PASS);
    }
    emit(p, mov_imm(R3, KEY_INET6));

    place(p, L_LOOKUP);                                          /* r3: the key */
    emit(p, insn(BPF_STX | BPF_MEM | BPF_W, R10, R3, -4, 0));    /* key on the stack */
    emit(p, mov_reg(R2, R10));
    emit(p, insn(BPF_ALU64 | BPF_ADD | BPF_K, R2, 0, 0, -4));
    emit(p, insn(BPF_LD | BPF_DW | BPF_IMM, R1, BPF_PSEUDO_MAP_FD, 0, map_fd));
    emit(p, insn(0, 0, 0, 0, 0));                                /* second half of the imm64 */
    emit(p, call(BPF_FUNC_map_lookup_elem));                     /* a referenced socket */
    jump_imm(p, BPF_JEQ, R0, 0, L_PASS);
    emit(p, mov_reg(R7, R0));
    emit(p, mov_reg(R1, R6));
    emit(p, mov_reg(R2, R7));
    emit(p, mov_imm(R3, 0));
    emit(p, call(BPF_FUNC_sk_assign));  /* fails (-EEXIST) if an earlier program chose */
    emit(p, mov_reg(R1, R7));
    emit(p, call(BPF_FUNC_sk_release));

    place(p, L_PASS);
    emit(p, mov_imm(R0, SK_PASS));
    emit(p, insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
    return link_jumps(p);
}

/* ---- setup ---- */

static int fail(char *err, unsigned errlen, const char *what)
{
    int saved = errno;
    snprintf(err, errlen, "port forwarding: %s: %s", what, strerror(saved));
    errno = saved;
    return -1;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* A listener on the family's loopback address, port chosen by the kernel.
 * IP_FREEBIND: a namespace of the shim's own has lo down until CNI (ctr run
 * --cni) brings it up after create; the steering needs no bound address. */
static int listener(int family)
{
    int one = 1;
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int ok = family == AF_INET
                 ? setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof one) == 0 &&
                       bind(fd, (struct sockaddr *)&a4, sizeof a4) == 0
                 : setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0 &&
                       setsockopt(fd, IPPROTO_IPV6, IPV6_FREEBIND, &one, sizeof one) == 0 &&
                       bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0;
    if (!ok || listen(fd, LISTEN_BACKLOG) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

static int map_put(int map_fd, uint32_t key, int sock_fd)
{
    uint64_t value = (uint64_t)sock_fd;
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_fd = (uint32_t)map_fd;
    a.key = (uint64_t)(uintptr_t)&key;
    a.value = (uint64_t)(uintptr_t)&value;
    a.flags = BPF_ANY;
    return (int)sys_bpf(BPF_MAP_UPDATE_ELEM, &a);
}

int pc_fwd_attach(struct pc_fwd_listeners *out, char *err, unsigned errlen)
{
    int map = -1, prog_fd = -1, netns = -1, rc = -1;
    struct prog p;
    union bpf_attr a;

    out->listen4 = out->listen6 = out->link = -1;
    if ((out->listen4 = listener(AF_INET)) < 0) {
        fail(err, errlen, "listen on 127.0.0.1");
        goto done;
    }
    /* A namespace (or kernel) without IPv6 forwards 127.0.0.1 alone. */
    out->listen6 = listener(AF_INET6);

    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_SOCKMAP;
    a.key_size = sizeof(uint32_t);
    a.value_size = sizeof(uint64_t);
    a.max_entries = KEYS;
    if ((map = (int)sys_bpf(BPF_MAP_CREATE, &a)) < 0) {
        fail(err, errlen, "create the sockmap");
        goto done;
    }
    if (map_put(map, KEY_INET, out->listen4) < 0 ||
        (out->listen6 >= 0 && map_put(map, KEY_INET6, out->listen6) < 0)) {
        fail(err, errlen, "add the listeners to the sockmap");
        goto done;
    }
    if (assemble(&p, map) < 0) {
        errno = E2BIG;
        fail(err, errlen, "assemble the sk_lookup program");
        goto done;
    }
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_SK_LOOKUP;
    a.expected_attach_type = BPF_SK_LOOKUP;
    a.insns = (uint64_t)(uintptr_t)p.insn;
    a.insn_cnt = (uint32_t)p.n;
    a.license = (uint64_t)(uintptr_t)"GPL";  /* sk_assign is a GPL-only helper */
    if ((prog_fd = (int)sys_bpf(BPF_PROG_LOAD, &a)) < 0) {
        /* Without the verifier's log: the error alone is one line. */
        fail(err, errlen, "load the sk_lookup program");
        goto done;
    }
    if ((netns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0) {
        fail(err, errlen, "open /proc/thread-self/ns/net");
        goto done;
    }
    memset(&a, 0, sizeof a);
    a.link_create.prog_fd = (uint32_t)prog_fd;
    a.link_create.target_fd = (uint32_t)netns;
    a.link_create.attach_type = BPF_SK_LOOKUP;
    if ((out->link = (int)sys_bpf(BPF_LINK_CREATE, &a)) < 0) {
        fail(err, errlen, "attach the sk_lookup program to the network namespace");
        goto done;
    }
    rc = 0;
done:
    /* The link holds the program, the program the map, the map the sockets. */
    close_fd(&map);
    close_fd(&prog_fd);
    close_fd(&netns);
    if (rc < 0)
        pc_fwd_detach(out);
    return rc;
}

void pc_fwd_detach(struct pc_fwd_listeners *l)
{
    close_fd(&l->link);
    close_fd(&l->listen4);
    close_fd(&l->listen6);
}

int pc_fwd_count_links(int netns_fd)
{
    struct stat st;
    uint32_t id = 0;
    int count = 0;
    if (fstat(netns_fd, &st) < 0)
        return -1;
    for (;;) {
        union bpf_attr a;
        memset(&a, 0, sizeof a);
        a.start_id = id;
        if (sys_bpf(BPF_LINK_GET_NEXT_ID, &a) < 0)
            return errno == ENOENT ? count : -1;
        id = a.next_id;
        memset(&a, 0, sizeof a);
        a.link_id = id;
        int fd = (int)sys_bpf(BPF_LINK_GET_FD_BY_ID, &a);
        if (fd < 0)
            continue; /* gone meanwhile */
        struct bpf_link_info info;
        memset(&info, 0, sizeof info);
        memset(&a, 0, sizeof a);
        a.info.bpf_fd = (uint32_t)fd;
        a.info.info_len = sizeof info;
        a.info.info = (uint64_t)(uintptr_t)&info;
        if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &a) == 0 && info.type == BPF_LINK_TYPE_NETNS &&
            info.netns.attach_type == BPF_SK_LOOKUP && info.netns.netns_ino == st.st_ino)
            count++;
        close(fd);
    }
}
