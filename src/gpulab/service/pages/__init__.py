"""The service's web pages (HTML from the Jinja templates in ``templates/``, with ``static/``
CSS and JS): home, jobs, the submit form, admin, secrets. They call what the API calls."""
