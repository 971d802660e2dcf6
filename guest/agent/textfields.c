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
