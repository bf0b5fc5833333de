"""The c4 aggregator: ingest -> host state -> diagnosis -> incidents/actions, API."""
