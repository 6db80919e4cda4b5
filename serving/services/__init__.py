"""gRPC servicers: the attnserve API and the KServe v2 inference protocol."""
