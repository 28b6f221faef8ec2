"""Agents: the FullConnected graph, the pipeline that serves a request call by call, and policies
that allocate reuse over a request's calls."""
