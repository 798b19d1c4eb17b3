/*
** fuzz.h — what the libFuzzer harnesses of tests/fuzz/ share: the entry point's signature
** and a file view of the input, for loaders that take a path (tokenizer.json, prompt files).
** Each harness feeds the input to one parser of bad input and checks only that it returns
** (a status, never a crash, leak or undefined behaviour: the build adds ASan and UBSan).
*/
#ifndef PRL_TESTS_FUZZ_H
#define PRL_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as an anonymous in-memory file, named by "/proc/self/fd/N" in path[n]; returns
** its descriptor (close it after), or -1. */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t n)
{
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, n, "/proc/self/fd/%d", fd);
    return fd;
}

#endif /* PRL_TESTS_FUZZ_H */
