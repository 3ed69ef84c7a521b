"""The process's own plumbing, standard library only: the signals it has received, and the
supervised child's channel to its parent. Anything in swafuzz may import these."""
