/* The one splitter of the launch spec's compound values (docs/agent-protocol.md). */
#ifndef PARACELL_AGENT_TEXTFIELDS_H
#define PARACELL_AGENT_TEXTFIELDS_H

/* Splits s in place into exactly n fields separated by sep: 0, or -1 when
 * there are fewer or more. */
int split_fields(char *s, char sep, char **f, int n);

#endif
