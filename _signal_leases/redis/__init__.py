"""Redis plumbing shared by the lease, pub/sub and signal backends: the client owner and error
mapping (:mod:`.support`), the waiting pools and the connections' writes and packing
(:mod:`.pools`), and Lua scripts called by ``EVALSHA`` (:mod:`.script`)."""
