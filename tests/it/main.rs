
mod sim_kube;
