#include "textfields.h"

#include <string.h>

int split_fields(char *s, char sep, char **f, int n)
{
    for (int i = 0; i < n - 1; i++) {
        f[i] = s;
        s = strchr(s, sep);
        if (!s)
            return -1;
        *s++ = 0;
    }
    f[n - 1] = s;
    return strchr(s, sep) ? -1 : 0;
}

int next_record(char **p, char **key, char **val)
{
    *key = *p;
    *p += strlen(*p) + 1;
    *val = strchr(*key, '=');
    if (!*val)
        return -1;
    *(*val)++ = 0;
    return 0;
}
