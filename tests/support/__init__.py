"""Helpers shared by the test modules: hubs, API clients, fake servers, a fake Runtime."""
