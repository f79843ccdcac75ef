"""One relayed request, top to bottom: keys, body, cost, admission, the engine's answer streamed
back with its errors reshaped, and what the stream teaches admission and the metrics."""
