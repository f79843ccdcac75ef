"""The bounded HTTP protocol in front of everything: request lines, headers, chunk framing,
connection caps and write deadlines enforced before the app sees a request."""
