/* LD_PRELOAD'ed into the tests' llama.cpp children on an x86 CPU with AMX (tests/conftest.py): ggml-cpu's AMX
 * buffer type faults in ggml_backend_amx_mul_mat on some Sapphire Rapids machines (ggml-org/llama.cpp#20824, open),
 * and llama-cpp-python's wheel, built by pip with -march=native, has it. ggml_amx_init (ggml-cpu/amx/amx.cpp) asks
 * the kernel for the AMX tile state with arch_prctl(ARCH_REQ_XCOMP_PERM); refused, it registers no AMX buffer type
 * ("AMX is not ready to be used!") and the weights go to CPU_REPACK as on any AVX-512 CPU: the same buffers as the
 * tests' own llama.cpp, built without AMX (tests/llama_cpp_source.py cpu_flags). Every other syscall passes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

#define ARCH_REQ_XCOMP_PERM 0x1023

long syscall(long number, ...) {
    va_list ap;
    long a[6];
    va_start(ap, number);
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_arch_prctl && a[0] == ARCH_REQ_XCOMP_PERM) {
        errno = EPERM;
        return -1;
    }
    static long (*real)(long, ...) = 0;
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
