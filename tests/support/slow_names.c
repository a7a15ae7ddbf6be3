/* getaddrinfo() that takes SLOW_NAMES_SECONDS (default 3) and then fails with EAI_AGAIN for the host
   names listed in SLOW_NAMES (comma-separated), as a lookup whose DNS server never answers does;
   every other name goes to the C library. Loaded with LD_PRELOAD (tests/support/slow_names.py). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*getaddrinfo_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

static int listed(const char *node) {
    const char *names = getenv("SLOW_NAMES");
    size_t n = strlen(node);
    while (names && *names) {
        const char *comma = strchr(names, ',');
        size_t len = comma ? (size_t)(comma - names) : strlen(names);
        if (len == n && strncmp(names, node, n) == 0)
            return 1;
        names = comma ? comma + 1 : NULL;
    }
    return 0;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res) {
    if (node && listed(node)) {
        const char *seconds = getenv("SLOW_NAMES_SECONDS");
        double s = seconds ? atof(seconds) : 3.0;
        struct timespec wait = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
        while (nanosleep(&wait, &wait) != 0) {
        }
        return EAI_AGAIN;
    }
    getaddrinfo_fn real = (getaddrinfo_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    return real(node, service, hints, res);
}
