/*
** hostdir.c — host-side directory handling that a sandboxed program can influence: making
** directories and removing a work dir the program has filled.
**
** The removal never follows a symlink the program planted (row 18 of the attack catalogue):
** it walks with openat(O_NOFOLLOW | O_DIRECTORY) from a directory fd, unlinks every entry
** with unlinkat on its name, and never builds a path string. It only runs after every
** process of the run is dead, so nothing can swap a directory for a link under it (row 19).
** Belt and braces, because this code runs as root: it enters only directories on the work
** dir's file system that belong to the slot's uid, so even a bug that followed a link could
** not reach a host directory.
** With a mount namespace none of this is needed: the work dir is a tmpfs that disappears
** with the namespace.
*/
#include "sandbox/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

prl_status sbx_mkdirs(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return prl_error_set(PRL_ERR_ARG, "sandbox: path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return prl_error_set(PRL_ERR_IO, "sandbox: mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST)
        return prl_error_set(PRL_ERR_IO, "sandbox: mkdir %s: %s", buf, strerror(errno));
    return PRL_OK;
}

/* Depth bound: a program can nest directories deeply; each level costs one fd here. */
enum { MAX_DEPTH = 256 };

typedef struct walk_guard {
    dev_t dev; /* the work dir's file system */
    uid_t uid; /* the slot's uid: owner of every directory the program made */
} walk_guard;

static int remove_tree(int dirfd, int depth, const walk_guard *g)
{
    if (depth > MAX_DEPTH) return -ELOOP;
    struct stat st;
    if (fstat(dirfd, &st) != 0) return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_dev != g->dev || (depth > 0 && st.st_uid != g->uid))
        return -EPERM; /* not a directory of this run: never touch it */
    int fd = dup(dirfd);
    if (fd < 0) return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    struct dirent *e;
    /* Deleting while reading can make readdir skip entries; loop until a pass finds none. */
    for (int found = 1; found && rc == 0;) {
        found = 0;
        rewinddir(d);
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            found = 1;
            if (unlinkat(dirfd, e->d_name, 0) == 0) continue;
            if (errno != EISDIR && errno != EPERM) {
                rc = -errno;
                break;
            }
            int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                rc = -errno;
                break;
            }
            /* The program may have made the dir unreadable or unwritable for its owner. */
            fchmod(sub, 0700);
            rc = remove_tree(sub, depth + 1, g);
            close(sub);
            if (rc == 0 && unlinkat(dirfd, e->d_name, AT_REMOVEDIR) != 0) rc = -errno;
            if (rc) break;
        }
    }
    closedir(d);
    return rc;
}

int sbx_remove_tree_at(int dirfd, uid_t owner)
{
    struct stat st;
    if (fstat(dirfd, &st) != 0) return -errno;
    walk_guard g = {.dev = st.st_dev, .uid = owner};
    return remove_tree(dirfd, 0, &g);
}
