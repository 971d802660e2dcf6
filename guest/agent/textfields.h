/* The one splitter of the records (`key=value`, each NUL-terminated) of SPEC,
 * SANDBOX, START and LIMITS, and of the launch spec's compound values
 * (docs/agent-protocol.md). */
#ifndef PARACELL_AGENT_TEXTFIELDS_H
#define PARACELL_AGENT_TEXTFIELDS_H

/* Splits s in place into exactly n fields separated by sep: 0, or -1 when
 * there are fewer or more. */
int split_fields(char *s, char sep, char **f, int n);
/* The record at *p, split in place at its first '=' into *key and *val;
 * *p moves past its NUL. 0, or -1 for a record without '='. The caller has
 * checked that the buffer ends with a NUL. */
int next_record(char **p, char **key, char **val);

#endif
