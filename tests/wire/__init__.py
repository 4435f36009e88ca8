"""The wire format Go asynq shares: the codec and protobuf (asyncq/_codec, asyncq/proto),
key names (asyncq/_keys), Go formats and durations (asyncq/_gofmt, _duration, _time),
Go-written data."""
