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
**
** Sockets are the exception, an allow list: a family the sandbox does not mean to offer is
** refused in every mode, because a net namespace covers only the internet families (vsock,
** for one, shares the hypervisor's port space with the host), and a future kernel's new
** family must not arrive open.
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
    "memfd_secret",
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

/* Socket families a program may create. Local sockets always (socketpair, multiprocessing,
** asyncio); the internet families only in a net namespace, where they reach nothing but its
** own loopback (without one, socket_filter: local sockets only). Sorted. */
static const int families_netns[] = {AF_UNIX, AF_INET, AF_INET6};
static const int families_local[] = {AF_UNIX};

/* Refused only with some arguments, for the policy report (the rules are in add_rules). */
static const char *const conditional[][2] = {
    {"socket, socketpair", "a family not allowed (EPERM)"},
    {"clone", "any CLONE_NEW* flag (EPERM)"},
    {"clone3", "always, with ENOSYS (glibc then uses clone)"},
    {"ioctl", "TIOCSTI or TIOCLINUX, low 32 bits compared (EPERM)"},
    {"personality", "a non-zero argument (EPERM)"},
    {"any syscall of another ABI", "i386 int 0x80, x32: the process is killed (SIGSYS)"},
};

static const char *family_name(int family)
{
    switch (family) {
    case AF_UNIX: return "AF_UNIX";
    case AF_INET: return "AF_INET";
    case AF_INET6: return "AF_INET6";
    }
    return "?";
}

void sbx_seccomp_policy(unsigned layers, prl_sandbox_policy *p)
{
    p->seccomp = (layers & PRL_SANDBOX_SECCOMP) != 0;
    p->refused = denied;
    p->n_refused = sizeof denied / sizeof denied[0];
    p->conditional = conditional;
    p->n_conditional = sizeof conditional / sizeof conditional[0];
    const int *fam = families_netns;
    size_t n = sizeof families_netns / sizeof families_netns[0];
    if (layers & PRL_SANDBOX_SOCKET_FILTER)
        fam = families_local, n = sizeof families_local / sizeof families_local[0];
    for (size_t i = 0; p->seccomp && i < n; i++) p->families[p->n_families++] = family_name(fam[i]);
}

/* Refuse `nr` (socket or socketpair) for every family but allowed[0..n) (sorted, > 0): the
** gaps below the largest one value by value, and everything above it. The comparisons are
** 64-bit on purpose: the kernel reads the family as an int, so a value with high bits set
** must not pass as an allowed one; every such value is above the largest and refused. */
static int deny_other_families(scmp_filter_ctx c, int nr, const int *allowed, size_t n)
{
    int rc = 0, f = 0;
    for (size_t i = 0; rc == 0 && i < n; i++, f++) /* f: the first value not yet handled */
        for (; rc == 0 && f < allowed[i]; f++)
            rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), nr, 1,
                                  SCMP_A0_64(SCMP_CMP_EQ, (scmp_datum_t)f));
    if (rc == 0)
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), nr, 1,
                              SCMP_A0_64(SCMP_CMP_GT, (scmp_datum_t)allowed[n - 1]));
    return rc;
}

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
    const int *fam = socket_filter ? families_local : families_netns;
    size_t n_fam = socket_filter ? sizeof families_local / sizeof families_local[0]
                                 : sizeof families_netns / sizeof families_netns[0];
    if (rc == 0) rc = deny_other_families(c, SCMP_SYS(socket), fam, n_fam);
    if (rc == 0) rc = deny_other_families(c, SCMP_SYS(socketpair), fam, n_fam);
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
