"""The operator's side of nsqworker: dead letters and the web console."""
