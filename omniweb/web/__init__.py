"""The HTTP and WebSocket edge shared by the apps' adapters: the session consumer base, transport,
authentication and security, middleware, access logs, the server's own pages and probes."""
