/*
** seccomp.c — the seccomp deny list (spec/sandbox.md §3.6), compiled once with libseccomp
** into a BPF program that the sandboxed child loads with a plain prctl just before execve.
**
** Why compile ahead: libseccomp allocates, and the child is forked from a multithreaded
** process, where only async-signal-safe calls are allowed. Why a deny list: interpreters
** (and whatever they spawn) use many syscalls; denying the dangerous ones is robust across
** languages. Denied calls fail with EPERM (ENOSYS for clone3, so glibc falls back to clone,
** whose flags BPF can inspect); a syscall from another ABI (i386 int 0x80, x32) kills the
** process with SIGSYS, which the run reports as status "killed".
*/
#include "sandbox/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

/* Denied outright with EPERM. */
static const char *const denied[] = {
    /* other processes' memory and tracing */
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    /* the file system tree and namespaces */
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    /* kernel attack surface */
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    /* the machine itself */
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "quotactl",
    "lookup_dcookie",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "vhangup",
};

static const unsigned long ns_flags[] = {CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWNET,   CLONE_NEWPID,
                                         CLONE_NEWIPC,  CLONE_NEWUTS, CLONE_NEWCGROUP};

static prl_status add_rules(scmp_filter_ctx c, int socket_filter)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof denied / sizeof denied[0]; i++) {
        int nr = seccomp_syscall_resolve_name(denied[i]);
        if (nr == __NR_SCMP_ERROR)
            return prl_error_set(PRL_ERR_UNSUPPORTED,
                                 "seccomp: libseccomp does not know syscall '%s'", denied[i]);
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), nr, 0);
        if (rc)
            return prl_error_set(PRL_ERR_IO, "seccomp: rule for %s: %s", denied[i], strerror(-rc));
    }
    /* clone's flags are a register: one masked rule per namespace flag (libseccomp cannot say
    ** "masked value != 0" in one rule). clone3 keeps its flags in memory, out of BPF's reach. */
    for (size_t i = 0; rc == 0 && i < sizeof ns_flags / sizeof ns_flags[0]; i++)
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    if (rc == 0) rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    /* Faking terminal input; compare the low 32 bits only: the kernel ignores the high ones,
    ** so a plain 64-bit EQ would be bypassed by setting them (CVE-2019-10063). */
    if (rc == 0)
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI));
    if (rc == 0)
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX));
    /* personality(0) (reset) is harmless; other values switch off ASLR or map page zero. */
    if (rc == 0)
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                              SCMP_A0(SCMP_CMP_NE, 0));
    static const int families[] = {AF_INET, AF_INET6, AF_PACKET, AF_NETLINK};
    for (size_t i = 0; socket_filter && rc == 0 && i < sizeof families / sizeof families[0]; i++)
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1,
                              SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)families[i]));
    if (rc) return prl_error_set(PRL_ERR_IO, "seccomp: adding a rule: %s", strerror(-rc));
    return PRL_OK;
}

/* libseccomp 2.5 can export only to an fd: export into a memfd and read it back. */
static prl_status export_bpf(scmp_filter_ctx c, struct sock_filter **prog, size_t *n)
{
    int fd = memfd_create("prl-seccomp", MFD_CLOEXEC);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "seccomp: memfd_create: %s", strerror(errno));
    int rc = seccomp_export_bpf(c, fd);
    off_t size = rc == 0 ? lseek(fd, 0, SEEK_END) : -1;
    if (rc || size <= 0 || size % (off_t)sizeof(struct sock_filter)) {
        close(fd);
        return prl_error_set(PRL_ERR_IO, "seccomp: exporting the filter: %s",
                             rc ? strerror(-rc) : "bad size");
    }
    *prog = malloc((size_t)size);
    if (!*prog) {
        close(fd);
        return prl_error_set(PRL_ERR_NOMEM, "seccomp: %lld bytes of filter", (long long)size);
    }
    ssize_t got = pread(fd, *prog, (size_t)size, 0);
    close(fd);
    if (got != size) {
        free(*prog);
        *prog = NULL;
        return prl_error_set(PRL_ERR_IO, "seccomp: reading the exported filter back");
    }
    *n = (size_t)size / sizeof(struct sock_filter);
    return PRL_OK;
}

prl_status sbx_seccomp_build(int socket_filter, struct sock_filter **prog, size_t *n)
{
    *prog = NULL;
    *n = 0;
    scmp_filter_ctx c = seccomp_init(SCMP_ACT_ALLOW);
    if (!c) return prl_error_set(PRL_ERR_NOMEM, "seccomp: seccomp_init failed");
    /* Only the native ABI is added, so i386 and x32 syscalls hit the bad-arch action. The
    ** child sets no_new_privs itself (it must come before Landlock too). */
    int rc = seccomp_attr_set(c, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
    if (rc == 0) rc = seccomp_attr_set(c, SCMP_FLTATR_CTL_NNP, 0);
    prl_status st = rc ? prl_error_set(PRL_ERR_IO, "seccomp: setting attributes: %s", strerror(-rc))
                       : add_rules(c, socket_filter);
    if (st == PRL_OK) st = export_bpf(c, prog, n);
    seccomp_release(c);
    return st;
}
