module github.com/deckhouse/service-with-healthchecks/images/agent

go 1.26.0

replace github.com/deckhouse/service-with-healthchecks/api => ../../api
