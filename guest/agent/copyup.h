/* runc's tmpcopyup: a tmpfs mounted over a directory of the image starts
 * with a copy of what it covers. */
#ifndef PARACELL_AGENT_COPYUP_H
#define PARACELL_AGENT_COPYUP_H

/* Copies everything under the directory from into the directory to:
 * directories, files, symlinks, fifos and device nodes, with their modes and
 * owners.  Never follows a symlink.  0, or -1 with errno. */
int copy_tree(int from, int to);

#endif
