"""An example service packaged into an image built FROM the nsqworker image."""
