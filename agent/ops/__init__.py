"""Process plumbing: executor leases, child processes, logging, calls off the event loop."""
