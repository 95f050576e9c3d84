"""Environment fleets: any session kind served by environment servers (``toolrl env serve``,
:mod:`toolrl.fleet.server`) and used through the ``fleet`` session kind (:mod:`toolrl.fleet.remote`),
each trajectory on one server of a fleet."""
